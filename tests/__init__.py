"""The tests, one folder per package folder (a package, so two folders may hold files of the same name)."""
