layerscope --help
