"""ctrlrun: consequential actions at most once, only as policy allows, with a receipt."""
