"""Built-in strategies.  They are registered through ``lightspec_register_strategies``
exactly like third-party plugins (see ``lightspec_core.builtins``)."""
