import layerscope

for rule, options in layerscope.health.parse_alerts(True).rules.items():
    print(f"{rule:19} {options}")
