"""``retail_support``: a store's support agent and a simulated customer (``app.py``)."""
