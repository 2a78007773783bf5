# ~/.bashrc of the test image's agent user. Sandboxed tools must not be able to
# change this file: an appended line would run in the user's next shell.
export PS1='agent$ '
