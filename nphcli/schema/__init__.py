"""What every command, job file and results file knows of a setting, torch-free: the fields (each
option of a run declared once) and the model catalog (every model's parameters)."""
