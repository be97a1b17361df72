layerscope runs runs
layerscope summary runs/quickstart
layerscope diff runs/quickstart runs/layout
layerscope plot runs/sql
layerscope report runs/sql -o report.html
