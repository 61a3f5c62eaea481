"""The topologies and configurations of deploy/, installed as package data of `tidelog.deploy`:
`tide cluster up` reads deploy/local.yaml (or any deploy/*.yaml named) from here when it runs
outside a clone of the repository."""
