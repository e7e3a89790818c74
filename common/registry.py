"""Model registries: ``config.MODULE`` names a class, ``build_model(config)`` builds it (no ``eval``)."""


class Registry:
    """Name -> class table of one task (each task has its own: VCR and VQA both name ``ResNetVLBERT``).

    Args:
        name: registry name used in error messages, e.g. 'vcr.modules'.
        classes: classes to register under their ``__name__``.
    """

    def __init__(self, name, classes=()):
        self.name = name
        self._classes = {}
        for cls in classes:
            self.register(cls)

    def register(self, cls):
        """Add ``cls`` under ``cls.__name__`` (usable as a decorator); ValueError on a duplicate name."""
        if cls.__name__ in self._classes:
            raise ValueError("{}: '{}' is already registered".format(self.name, cls.__name__))
        self._classes[cls.__name__] = cls
        return cls

    def get(self, name):
        """The class registered as ``name``; KeyError listing the known names otherwise."""
        if name not in self._classes:
            raise KeyError("MODULE '{}' is not a model of {}; known: {}".format(
                name, self.name, ', '.join(sorted(self._classes)) or '(none)'))
        return self._classes[name]

    def build(self, config):
        """``cls(config)`` for ``cls = self.get(config.MODULE)``."""
        return self.get(config.MODULE)(config)
