"""dbvt-server: dbvt broadphase worlds served over gRPC (`dbvt.v1.BroadphaseService`).

`dbvt_server.app.create_server(config)` starts one in a running event loop; `dbvt-server` is the
command line (`dbvt_server.__main__`), `dbvt-bench` the benchmark (`dbvt_server.bench`).
"""
__version__ = "0.1.0"
