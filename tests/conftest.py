"""Test-suite settings that must hold before anything imports huggingface_hub.

No test may reach the network: huggingface_hub reads ``HF_HUB_OFFLINE`` once, at import,
so it is set here, before the test modules import transformers (subprocesses inherit it)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
