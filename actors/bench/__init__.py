"""llamactor.bench: ``llamactor bench``, its workloads, baselines and report."""
