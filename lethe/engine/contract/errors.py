"""The one exception the engine raises for bad input: the CLI and the service turn it into a 4xx."""


class EngineInputError(ValueError):
    """Input the engine refuses: the message names the record or parameter at fault."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field
