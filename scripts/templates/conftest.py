# The template's tests run only once rendered into a kernel folder (scripts/new_kernel.py).
collect_ignore_glob = ["*"]
