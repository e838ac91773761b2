"""A custom task for the trainer: ``task=examples.custom_task.my_task:build``."""
