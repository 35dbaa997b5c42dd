"""The operator surface's domain: one service (`Operator`) with a method per action, the errors
it refuses with, and the audit line naming who acted. The HTTP API, the console and the CLI
call it; none of them checks or changes state on its own."""
