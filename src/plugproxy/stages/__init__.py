"""Pipeline stages, one module each; their order is in plugproxy.pipeline."""
