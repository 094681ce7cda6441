"""Where the nodes of a throwaway RabbitMQ cluster (``composition.testing.rabbitmq_cluster``)
keep their files, and the environment each node and CLI call runs with: one temporary directory
and an environment built from nothing, so none of them reads the machine's own node's files,
cookie or port mapper.
"""

from __future__ import annotations

import os
import pwd
import secrets
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CTL_ERL_ARGS", "RABBITMQ_BIN_DIR", "SERVER_ERL_ARGS", "ClusterLayout"]

RABBITMQ_BIN_DIR = Path("/usr/lib/rabbitmq/bin")

# One scheduler per node and no busy-waiting: three nodes share two cores with the tests, and a
# spinning scheduler would take a core each for nothing. The distribution listens on loopback only.
SERVER_ERL_ARGS = ("+S 1:1 +sbwt none +sbwtdcpu none +sbwtdio none -start_epmd false "
                   "-kernel inet_dist_use_interface {127,0,0,1}")
CTL_ERL_ARGS = "-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}"


@dataclass(frozen=True)
class ClusterLayout:
    """The files and environment of a cluster whose nodes are ``node_names``, in ``directory``."""

    directory: Path
    node_names: list[str]
    ports: list[int]  # AMQP, one per node
    dist_ports: list[int]  # Erlang distribution, one per node
    epmd_port: int  # the cluster's own port mapper

    def node_dir(self, index: int) -> Path:
        return self.directory / f"node{index + 1}"

    def write(self, user: pwd.struct_passwd | None) -> None:
        """Create the directory's files, owned by ``user`` (the server's, when running as root)."""
        # Read by rabbitmq-env (the scripts) and rabbit_env (the server and the CLI) instead of
        # /etc/rabbitmq/rabbitmq-env.conf, which names the machine's node.
        (self.directory / "rabbitmq-env.conf").write_text("# everything is in the environment\n")
        # The cluster's own cookie, in the HOME every node and CLI call of the cluster runs with.
        cookie = self.directory / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(20).upper())
        cookie.chmod(0o400)
        for index, port in enumerate(self.ports):
            node_dir = self.node_dir(index)
            (node_dir / "conf.d").mkdir(parents=True)
            (node_dir / "rabbitmq.conf").write_text(
                f"listeners.tcp.default = 127.0.0.1:{port}\n"
                "log.console = false\n"
                "log.file.level = info\n")
            (node_dir / "enabled_plugins").write_text("[].\n")
        if user is not None:
            for path in (self.directory, *self.directory.rglob("*")):
                os.chown(path, user.pw_uid, user.pw_gid)

    def common_env(self) -> dict[str, str]:
        # Built from nothing: the test process's RABBITMQ_* or ERL_FLAGS must not leak in.
        return {
            "PATH": f"{RABBITMQ_BIN_DIR}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.directory),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_CONF_ENV_FILE": str(self.directory / "rabbitmq-env.conf"),
            "RABBITMQCTL_ERL_ARGS": CTL_ERL_ARGS,
        }

    def node_env(self, index: int) -> dict[str, str]:
        node_dir = self.node_dir(index)
        return {
            **self.common_env(),
            "RABBITMQ_NODENAME": self.node_names[index],
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.ports[index]),
            "RABBITMQ_DIST_PORT": str(self.dist_ports[index]),
            "RABBITMQ_CONFIG_FILE": str(node_dir / "rabbitmq.conf"),
            "RABBITMQ_CONFIG_FILES": str(node_dir / "conf.d" / "*.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(node_dir / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(node_dir / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(node_dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(node_dir / "log"),
            "RABBITMQ_PID_FILE": str(node_dir / "rabbitmq.pid"),
            "RABBITMQ_MOTD_FILE": str(node_dir / "motd"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": SERVER_ERL_ARGS,
            # rabbitmq-server then execs the VM instead of waiting on it in a shell: the pid we
            # hold is the node's, and the node itself dies with the test process (set by
            # become(); a shell in between would die alone and leave the VM running).
            "detached": "true",
        }
