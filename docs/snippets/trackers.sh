python examples/sinks.py --out sinks
layerscope export sinks/run --tensorboard tb/replay
MLFLOW_ALLOW_FILE_STORE=true layerscope export sinks/run --mlflow --tracking-uri mlruns --experiment replays
WANDB_MODE=offline layerscope export sinks/run --wandb --project replays
