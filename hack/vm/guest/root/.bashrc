# root's shell rc in the crust VM test bed: stands in for the host's own
# (sshd's bash reads it for every command; the runner passes its own env).
