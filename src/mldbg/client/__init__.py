"""The typed client every surface uses: ``api.Client`` over one kept-alive HTTP/1.1
connection (``http1``) to the daemon, started on demand."""
