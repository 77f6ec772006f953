# The status page reads jobs.Interruption; it stores nothing of its own.
