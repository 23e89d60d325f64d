//! Who am I, how many are we, where is rank 0: launcher detection (to be moved here from ringcc-verbs).
