"""`flashq sim`: a discrete-event model of a whole run (`simulator`) and its constants, fitted to
real runs (`calibration`)."""
