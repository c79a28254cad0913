"""Running the pipeline: profile workspaces for ``dvc repro`` and the champion model of scheduled retraining.
"""
