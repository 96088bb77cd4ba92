"""The errors the module raises for mistakes in what it is given."""


class ConfigError(ValueError):
    """A mistake in a config, located as `train` locates it.

    Attributes: ``file``, ``line``, ``column`` (None where the location has none, e.g. a key
    that an override gave), ``location`` (the text: ``model.yaml:9:21``, the file alone, or the
    ``--set`` override) and ``key_path`` (``train.batch_size``; "" for the config as a whole).
    """

    def __init__(self, message, location="", key_path=""):
        super().__init__(message)
        self.location = location
        self.key_path = key_path
        self.file, self.line, self.column = location, None, None
        parts = location.rsplit(":", 2)
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            self.file, self.line, self.column = parts[0], int(parts[1]), int(parts[2])
