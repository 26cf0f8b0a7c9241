"""One process's run: the recipe, its stages and the loop, on every floor below.

- `recipe.py`: the run as named stages, in their order (setup, resume, train, export, summary,
  cleanup); `run_state.py`: the typed parts of the run's state the stages hand on.
- `setup.py`: the checks and the launch before any weight loads, then the model, rows, guard and
  optimizer; `resume.py`: the latest checkpoint, the reporter, the loop and the evaluation
  (evaluation/); `steps.py`: the base's evaluation, the steps with their checkpoints,
  evaluations and stop, the tuned model's evaluation; `recipe_outputs.py`: what the stages write
  (checkpoints, the adapter and its formats, the samples, the summary).
- `loop.py`: the optimizer step and the evaluation, the same for one process and N.
- `optim.py`: the optimizers' factories and the schedule.
- `launch_plan.py`: the pod's launch decision (mode, processes, plan, attention), made once by
  the pod's command (`launch`) and handed down, or by the recipe itself when none was.

It must not import `launch`: the command line starts the recipe, never the other way round.
"""
