"""Generated from proto/ by proto/generate.py; do not edit."""
