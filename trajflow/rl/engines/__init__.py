"""Generation engines. This package's `__init__` imports nothing, so `trajflow.rl.engines.base` (torch-free) can be
imported alone; the engines are `trajflow.rl.engines.hf`, `trajflow.rl.engines.vllm`, `trajflow.rl.engines.scripted`,
built by `trajflow.rl.engines.load.load_engine`."""
