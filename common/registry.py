"""Name -> object tables: models (``MODULE``), datasets (``DATASET.DATASET``) and tasks share this class.

A config names what to build (``MODULE: ResNetVLBERT``); the registry turns the name into the
class without ``eval`` and says which names exist when the name is unknown (the idea of
maskrcnn-benchmark ``modeling/registry.py``).
"""


class Registry:
    """Name -> object table.

    Args:
        name: what the table holds, for error messages: 'model of vcr', 'dataset', 'task'.
        items: objects to register under their ``__name__``.
        key: the config key whose value is looked up here (for error messages), e.g. 'MODULE'.
        hint: appended to the unknown-name error (how to make a name known).
    """

    def __init__(self, name, items=(), key="MODULE", hint=""):
        self.name = name
        self.key = key
        self.hint = hint
        self._items = {}
        for item in items:
            self.register(item)

    def register(self, obj=None, name=None):
        """Add ``obj`` under ``name`` (default ``obj.__name__``); returns ``obj``.

        Usable as ``register(obj)``, ``register(obj, 'name')`` or as a decorator
        ``@register()`` / ``@register(name='x')``.

        Raises:
            ValueError: ``name`` is already registered for another object.
        """
        if obj is None:
            return lambda o: self.register(o, name)
        name = name or obj.__name__
        if name in self._items and self._items[name] is not obj:
            raise ValueError("{}: '{}' is already registered".format(self.name, name))
        self._items[name] = obj
        return obj

    def get(self, name):
        """The object registered as ``name``.

        Raises:
            KeyError: unknown name; the message lists the known ones.
        """
        if name not in self._items:
            raise KeyError("{} '{}' is not a registered {}; known: {}{}".format(
                self.key, name, self.name, ", ".join(sorted(self._items)) or "(none)", self.hint))
        return self._items[name]

    def __contains__(self, name):
        return name in self._items

    def names(self):
        """Registered names, sorted."""
        return sorted(self._items)

    def build(self, cfg):
        """``cls(cfg)`` for ``cls = self.get(cfg.MODULE)``: the model a config names."""
        return self.get(cfg.MODULE)(cfg)
