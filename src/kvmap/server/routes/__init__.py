"""The API's routes, one module per endpoint family; each exports ``router``."""
