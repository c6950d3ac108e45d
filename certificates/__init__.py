"""Package data (import name `nbxcert.shipped_certificates`): the certificates shipped with nbxcert, found through
importlib.resources, laid out `<vendor>/<profile>/<kernel>.<dtype>.json`."""
