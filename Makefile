.PHONY: demo test up down status lint

demo:  ## bootstrap, bring the local stack up, run dbq on it
	bash stack/demo.sh

test:  ## the whole test suite on the real local stack
	bash stack/test.sh

up:
	$(HOME)/.cache/dbq/venv/bin/dbq dev up
down:
	$(HOME)/.cache/dbq/venv/bin/dbq dev down
status:
	$(HOME)/.cache/dbq/venv/bin/dbq dev status
