"""A small project of one's own: a task plug-in (``task.py``) and its model (``model.py``)."""
