"""dbvt-server: dbvt broadphase worlds served over gRPC (`dbvt.v1.BroadphaseService`).

What a world does is `dbvt_server.worlds` (one world, its atomic batch and its queries) and
`dbvt_server.service` (the registry of worlds); `dbvt_server.servicer` adapts them to gRPC, and
`dbvt_server.local` serves them in-process to `Client.local()`. `dbvt_server.app.create_server(config)`
starts a server in a running event loop; `dbvt-server` is the command line (`dbvt_server.__main__`),
`dbvt-bench` the benchmarks (`dbvt_server.bench`).
"""
__version__ = "0.1.0"
