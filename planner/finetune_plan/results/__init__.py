"""What the planner hands back: the plan and the records it is made of.

Plain frozen records, computed by the search (`search`), the layouts (`layouts`), the activation
sizing (`recompute`) and the host memory (`host`), and read by everyone else: the trainer applies
them, the operator sizes the pod from them, `ftjob plan` prints them (`messages`) and the bench
compares them with measured runs. They compute nothing of their own beyond reading their parts,
so a figure has one source whichever reader asks for it.
"""
