"""``lightspec serve``: the OpenAI-compatible server on the command line (registered by
``cli``; the server itself is ``lightspec_core.server``)."""

from __future__ import annotations

import click

from .errors import InvalidValueError, LightSpecError


@click.command()
@click.option("--model", "model", default=None,
              help="Target model: a hub id (org/name, through the HF cache) or a local folder (default: the embedded model).")
@click.option("--strategy", default=None, help="Default strategy: NAME, NAME:OPTION=VALUE,... or a YAML file "
                                               "(default: hybrid); a request may name another in its 'strategy' field "
                                               "('none': speculation off).")
@click.option("--draft-model", default=None, help="Draft model (hub id or local folder) for draft_model / hybrid.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=int, default=8080, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True,
              help="Requests decoded together (continuous batching: they join and leave between steps).")
@click.option("--max-queue", type=int, default=256, show_default=True,
              help="Requests waiting beyond --batch-size; more get 429.")
@click.option("--api-key", default=None, envvar="LIGHTSPEC_API_KEY",
              help="Require 'Authorization: Bearer KEY' on every route but /health (env LIGHTSPEC_API_KEY).")
@click.option("--served-model-name", default=None, help="The model id clients send (default: the model folder's name).")
@click.option("--max-body-bytes", type=int, default=1 << 20, show_default=True, help="Larger request bodies get 413.")
@click.option("--budget", default=None, help="Budget policy for every strategy: NAME[:OPTION=VALUE,...] or a YAML file.")
@click.option("--device", default=None, help="cpu, cuda or auto.")
@click.option("--dtype", default=None, help="float32, bfloat16, float16 or auto.")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice).")
@click.option("--lean-target/--hf-target", default=True, show_default=True,
              help="Run the target through LightSpec's exact lean forward where it reproduces HF's bit for bit.")
def serve(model, strategy, draft_model, host, port, batch_size, max_queue, api_key, served_model_name, max_body_bytes,
          budget, device, dtype, threads, lean_target):
    """Serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /metrics)."""
    try:
        from .server import serve as serve_app
    except ImportError as exc:
        raise LightSpecError(f"serving needs the serve extra ({exc.name} is missing): "
                             "pip install 'lightspec-core[serve]'") from None
    for name, value, low in (("--port", port, 0), ("--batch-size", batch_size, 1), ("--max-queue", max_queue, 0),
                             ("--max-body-bytes", max_body_bytes, 1)):
        if value < low or (name == "--port" and value > 65535):
            raise InvalidValueError(f"{name} {value} is invalid: use an integer >= {low}"
                                    + (" and <= 65535" if name == "--port" else ""))
    from .cli import _budget_and_sinks, _defaults, _set_threads
    from .pipeline import MTPPipeline

    d = _defaults()
    _set_threads(threads)

    budget_spec = budget or d.get("budget")
    _budget_and_sinks(budget_spec, ())  # a bad --budget fails before the model loads
    pipe = MTPPipeline.from_pretrained(
        model or d.get("model"), strategy=strategy or d.get("strategy", "hybrid"),
        draft_model=draft_model or d.get("draft_model"), device=device or d.get("device"),
        dtype=dtype or d.get("dtype"), progress=True, lean_target=lean_target,
        **({"budget": budget_spec} if budget_spec else {}))
    options = {"lean_target": lean_target, **({"budget": budget_spec} if budget_spec else {})}
    click.echo(f"serving {served_model_name or model or 'the embedded model'} on http://{host}:{port} "
               f"(strategy {pipe.strategy_name}, batch size {batch_size})", err=True)
    serve_app(pipe, port=port, batch_size=batch_size, host=host, api_key=api_key, max_queue=max_queue,
              model_name=served_model_name, max_body_bytes=max_body_bytes, pipeline_options=options)
