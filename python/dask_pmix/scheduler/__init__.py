"""Code that runs in the Dask scheduler: the SidecarPlugin, the sidecar it embeds, and what it
relays between the clients, the workers and the sidecar."""
