"""The image write path's Spark side: its batch job and the tasks that turn each interval's image
into a new one; its writes are ``statestore/writepath/image/``.
"""
