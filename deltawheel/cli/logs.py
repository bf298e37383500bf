"""The CLI's log noise: Spark's (log4j) and ZooKeeper's (kazoo) lines stay off its output unless
``deltawheel --verbose`` (then Spark logs at ``WARN`` and Python at INFO on stderr)."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import tempfile

__all__ = ["configure", "spark_log_level"]

_QUIET_LOG4J2 = """\
# deltawheel's CLI without --verbose: Spark logs nothing (its errors reach the CLI as exceptions)
status = error
rootLogger.level = off
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
# the launching class's level equal to the root's: no "Setting default log level" lines at start
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = off
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = off
"""

_verbose = False


def configure(verbose: bool) -> None:
    """Set the logging of this CLI process (before it starts a Spark session or a kazoo client)."""
    global _verbose
    _verbose = verbose
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return
    for name in ("kazoo", "py4j"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    if "SPARK_CONF_DIR" not in os.environ and "log4j2.configurationFile" not in os.environ.get("SPARK_SUBMIT_OPTS", ""):
        conf = tempfile.mkdtemp(prefix="deltawheel-sparkconf-")
        path = os.path.join(conf, "log4j2.properties")
        with open(path, "w") as f:
            f.write(_QUIET_LOG4J2)
        atexit.register(functools.partial(shutil.rmtree, conf, ignore_errors=True))
        # a system property of the driver JVM, not a SPARK_CONF_DIR: a folder with files on the JVM's
        # class path would keep it from mapping the class-data archive (statestore/session/cds.py)
        opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
        os.environ["SPARK_SUBMIT_OPTS"] = f"{opts} -Dlog4j2.configurationFile=file:{path}".strip()


def spark_log_level() -> str:
    """The Spark session's log level for this CLI process: ``WARN`` with ``--verbose``, else ``OFF``."""
    return "WARN" if _verbose else "OFF"
