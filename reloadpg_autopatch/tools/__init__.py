"""Tools built on the package: the doctor, the demo and its ranks, the launcher, the scanner."""
