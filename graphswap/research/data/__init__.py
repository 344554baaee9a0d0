"""The bottom floor of research: what a model is fed and what it is for.

data (what a model expects, the validated Data container), datafiles (.npz archives and image
folders read defensively), dataset_labels (a tf.data dataset's labels), text_data (string
inputs), loading (reading every source, fitted to the model), task and output_task (what a model
is for, derived once from its saved loss: labels, metrics, score), scoring (a model's outputs on
data and the metrics of its task).  Nothing here imports the floors above (training, analysis,
exploration).
"""
