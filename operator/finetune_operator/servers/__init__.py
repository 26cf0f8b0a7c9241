"""ModelServers: llama-server Deployments of finished jobs' GGUF files, one per server.

| module | what it owns |
| --- | --- |
| `decide.py` | one reconcile's decision: refusals, the children to make, the Deployment to apply again, the status |
| `status.py` | the status from the Deployment and its pods: phase, Ready and Progressing, the Warnings worth posting |
| `reconcile.py` | the applier and its queue: reads the server and what it names from the API server, carries out |

The pure builders of the Deployment, Service and NetworkPolicy are builders/model_server.py; the
refusals that need the namespace's jobs and claims are finetune_api.served_files, shared with
`ftjob validate`. Must not import the FineTuneJob side's status logic but its pod readers
(status/pods.py), nor be imported by it.
"""
