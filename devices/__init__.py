"""Package data: devices files shipped with nbxcert, found through importlib.resources."""
