"""Package data: certificates files shipped with nbxcert, found through importlib.resources."""
