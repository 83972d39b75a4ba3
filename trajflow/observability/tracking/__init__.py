"""Experiment tracking: one logger interface for a run's step metrics, evals and config (TensorBoard, W&B, MLflow)."""
