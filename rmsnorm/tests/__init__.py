"""The rmsnorm test suite (a package, so that its module names do not collide with activation/tests).

activation/tests has test_layers.py and test_torch_library.py too, and `scripts/dev.sh test`
collects every kernel's tests in one pytest session: without this file pytest would import both
as the top-level modules `test_layers` / `test_torch_library` and stop with "import file
mismatch". As a package they are `tests.test_layers`, ...
"""
