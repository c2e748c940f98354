"""The one place the server names the class each world is made of."""
from dbvt import Broadphase as WorldBroadphase

__all__ = ["WorldBroadphase"]
