"""What the docs site generates from the code (`mkdocs.yml` runs `docgen.hooks`): the reference
pages' tables, the performance charts, and the runnable examples the tests execute."""
