layerscope demo
