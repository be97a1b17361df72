python examples/attention.py images
layerscope summary runs/attention --plain | sed -n '/^attention heads/,/^$/p'
