.PHONY: demo demo-cluster demo-gitops test up down status lint

demo:  ## bootstrap, bring the local stack up, run dbq on it
	bash stack/demo.sh

demo-cluster:  ## the same, with the operator installed by Helm as a pod on the single-node cluster
	bash stack/demo-cluster.sh

demo-gitops:  ## Flux applies a git repository of Queues; the operator brings them to Ready
	bash stack/demo-gitops.sh

test:  ## the whole test suite on the real local stack
	bash stack/test.sh

up:
	$(HOME)/.cache/dbq/venv/bin/dbq dev up
down:
	$(HOME)/.cache/dbq/venv/bin/dbq dev down
status:
	$(HOME)/.cache/dbq/venv/bin/dbq dev status
