package struct WorkerConfiguration {}
