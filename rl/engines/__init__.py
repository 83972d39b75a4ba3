"""Generation engines. This package's `__init__` imports nothing, so `rl.engines.base` (torch-free) can be
imported alone; the engines are `rl.engines.hf`, `rl.engines.vllm`, `rl.engines.scripted`, built by
`rl.engines.load.load_engine`."""
