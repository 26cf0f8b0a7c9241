"""`ftjob` (also `kubectl finetune`): the user's command line for FineTuneJobs."""
