# Puma configuration of tests/e2e/test_rails.py (threads and bind come from the command line).
# SIGTERM stops the server gracefully and Puma::CLI#run returns, so the process ends through its at_exit handlers with
# status 0 (the in-process reference writes its trace there) instead of re-raising SIGTERM.
raise_exception_on_sigterm false
