/*
 * The pod sandbox's placeholder process (the "pause" container of a CRI pod).
 *
 * It holds the pod's namespaces open and does nothing else: it blocks SIGTERM,
 * SIGINT and SIGCHLD, waits for them synchronously, reaps any child that the
 * pod's shared PID namespace hands it, and exits 0 on SIGTERM or SIGINT.
 * Synchronous waiting (sigwaitinfo) instead of handlers keeps it free of
 * async-signal-safety concerns. As PID 1 of a PID namespace a process ignores
 * signals it has no disposition for, so blocking and waiting is also what makes
 * SIGTERM reach it at all.
 *
 * Built static by hack/images.sh (bundles/pause/image.conf); no libraries needed
 * at run time.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

int main(int argc, char **argv)
{
    sigset_t waited;

    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        puts("agent-sandbox pause 1");
        return 0;
    }
    sigemptyset(&waited);
    sigaddset(&waited, SIGTERM);
    sigaddset(&waited, SIGINT);
    sigaddset(&waited, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &waited, NULL) != 0) {
        perror("pause: sigprocmask");
        return 1;
    }
    for (;;) {
        int sig = sigwaitinfo(&waited, NULL);

        if (sig < 0) {
            if (errno == EINTR)
                continue;
            perror("pause: sigwaitinfo");
            return 1;
        }
        if (sig == SIGCHLD) {
            while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
            continue;
        }
        return 0;
    }
}
