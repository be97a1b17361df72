"""Callbacks that watch a model from inside a trainer, one module per framework.

``layerscope.integrations.lightning.LayerscopeCallback`` for Lightning's ``Trainer`` and
``layerscope.integrations.transformers.LayerscopeCallback`` for the Hugging Face ``Trainer``
take ``watch()``'s options and write a run next to the trainer's logs. Each framework is
imported only by its own module: ``import layerscope`` imports neither this package nor them.
"""
