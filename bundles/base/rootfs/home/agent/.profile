# ~/.profile of the test image's agent user (a protected path).
[ -f "$HOME/.bashrc" ] && . "$HOME/.bashrc"
